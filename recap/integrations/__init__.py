"""Adapters for agent frameworks, each over Recap's host API and behind its optional extra:

- ``recap.integrations.openai_agents``: ``RecapSession``, an OpenAI Agents SDK session
  (``pip install 'recap[openai-agents]'``);
- ``recap.integrations.langchain``: ``RecapMiddleware``, a LangChain v1 agent middleware
  (``pip install 'recap[langchain]'``);
- ``recap.integrations.pydantic_ai``: ``RecapHistory``, a Pydantic AI history processor and
  capability (``pip install 'recap[pydantic-ai]'``).

The conversions between each framework's message types and Recap's (OpenAI chat format) are in
``recap.convert``, one module per framework.
"""
