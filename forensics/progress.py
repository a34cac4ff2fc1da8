"""How a long library step tells its caller where it is; the library itself never prints."""

from __future__ import annotations

from collections.abc import Callable

# progress(what runs now, steps done before it, steps in all): called before each step of a
# long stage (detection, attribution, the report) so a caller can show where it is; ingest
# calls it with (file, bytes done, bytes in the file).
StepProgress = Callable[[str, int, int], None]
