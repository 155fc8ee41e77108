"""The torch-free contract: errors, how a parameter is declared, record checks, the chat
format, the memory plan and model-file checks. The API checks requests with these and loads no torch."""
