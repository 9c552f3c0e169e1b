"""The errors of a reward function: refused before the run starts, or failed on one attempt.

A ``reward.function`` that cannot be used (a malformed setting, a module that
cannot be imported, a missing attribute, something not callable, a wrong
signature) is a :class:`~rollvault.config.errors.ConfigError`: ``rollvault
run`` refuses to start (exit 2) and the message names ``reward.function``,
the module or file, and the attribute.

A function that fails on one response (it raises, returns a non-finite
reward or a value of the wrong type, or runs past ``reward.timeout_s``) is a
:class:`~rollvault.tasks.protocols.PromptEnvironmentError`: the gate turns it
into a data failure of that attempt, logged with the exception and the
dataset row in ``attempts.jsonl``, and the retry budgets decide the rest.
"""

from __future__ import annotations

from rollvault.config.errors import ConfigError
from rollvault.tasks.protocols import PromptEnvironmentError

__all__ = [
    "RewardFunctionAttributeError",
    "RewardFunctionConfigError",
    "RewardFunctionImportError",
    "RewardFunctionNotCallableError",
    "RewardFunctionRaisedError",
    "RewardFunctionResultError",
    "RewardFunctionScoreError",
    "RewardFunctionSignatureError",
    "RewardFunctionSpecError",
    "RewardFunctionTimeoutError",
]


class RewardFunctionConfigError(ConfigError):
    """``reward.function`` names nothing this run can call (refused before the run starts)."""


class RewardFunctionSpecError(RewardFunctionConfigError):
    """``reward.function`` is not a built-in name, ``module:function`` or ``path.py:function``."""


class RewardFunctionImportError(RewardFunctionConfigError):
    """The module or file ``reward.function`` names cannot be found or imported."""


class RewardFunctionAttributeError(RewardFunctionConfigError):
    """The module or file has no attribute of the name ``reward.function`` gives."""


class RewardFunctionNotCallableError(RewardFunctionConfigError):
    """The attribute ``reward.function`` names is not callable."""


class RewardFunctionSignatureError(RewardFunctionConfigError):
    """The function cannot be called as ``function(response_text, sample)``."""


class RewardFunctionScoreError(PromptEnvironmentError):
    """The reward function failed on one response: a data failure of that attempt."""


class RewardFunctionRaisedError(RewardFunctionScoreError):
    """The reward function raised."""


class RewardFunctionResultError(RewardFunctionScoreError):
    """The reward function returned something that is not a finite reward."""


class RewardFunctionTimeoutError(RewardFunctionScoreError):
    """The reward function did not return within ``reward.timeout_s``."""
