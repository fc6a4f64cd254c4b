"""`kvferry bench responses`: the Responses API's previous_response_id turns moved between workers."""
