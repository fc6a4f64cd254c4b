"""OpenAI's Responses API over kvferry's chat jobs: a response is a chat completion job (rendered
with the chat template, continuing a kvferry session) whose record, kept in the queue Redis,
lets a later request continue it by `previous_response_id` on any worker."""
