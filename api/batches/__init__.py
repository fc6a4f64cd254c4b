"""The OpenAI Batch API over the queue: batch records, line validation, and the runner that feeds a
batch's lines as jobs, collects their answers into part files and finalizes the output files."""
