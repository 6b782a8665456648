"""What every integration shares: the seams (:mod:`.seams`), the table of host libraries
(:mod:`.table`), release ranges (:mod:`.releases`) and function shapes (:mod:`.shapes`).

Nothing here knows a host library; the library folders beside it (``accelreg.integrations.<library>``)
build on it. Importing this package imports none of its modules.
"""
