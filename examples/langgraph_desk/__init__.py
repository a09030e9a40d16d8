"""The help desk on a LangGraph ReAct agent (see ``__main__``)."""
