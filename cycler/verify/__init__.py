"""``cycle verify``: prove on a user's own script that a stopped and resumed run ends identical
to an uninterrupted one, and name what was not restored when it does not.

- :mod:`.runner` drives real ``cycle run`` processes and interrupts them;
- :mod:`.capture` keeps every checkpoint a run commits, before the script's retention drops it;
- :mod:`.plan` chooses where to interrupt (a pure function);
- :mod:`.compare` compares two checkpoints bit for bit;
- :mod:`.causes` names the likely cause of a difference;
- :mod:`.went_back` finds a resumed start that went back (a checkpoint never loaded);
- :mod:`.session` puts them together; :mod:`.result` is what it found.
"""

from cycler.verify.result import VerifyResult
from cycler.verify.session import NothingToVerify, VerifyOptions, verify

__all__ = ["NothingToVerify", "VerifyOptions", "VerifyResult", "verify"]
