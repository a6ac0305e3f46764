"""Tools and grammars: what an answer must look like, and the tool calls in it.

JSON-schema and tool-call constraints, their grammars (the ``tools`` extra), the parsing of tool
calls from an answer and their OpenAI wire models.
"""
