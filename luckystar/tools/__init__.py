"""Tools a rollout may call; model output is untrusted input to every one of them."""

# The tool name an NL2SQL agent calls in its action: {"tool_name": "execute_sql", "parameters": {"query": ...}}.
SQL_TOOL = 'execute_sql'
# Exact arithmetic for math traces: {"tool_name": "calculator", "parameters": {"expression": "12 × 15 + 7"}}.
CALCULATOR_TOOL = 'calculator'
