"""srl's built-in verifiers v1 tasksets. Each module exports exactly one Taskset subclass in ``__all__``."""

BUILTIN_TASKSETS: dict[str, str] = {
    "reverse-text": "toolkit.envs.tasksets.reverse_text",
    "alphabet-sort": "toolkit.envs.tasksets.alphabet_sort",
    "arith": "toolkit.envs.tasksets.arith",
}
"""Built-in taskset id -> module. These ids win over installed packages of the same name."""
