"""What an operator sees at 3 a.m.: ``operations_snapshot()`` gathers the admin's operations
page from the functions the commands use (``snapshot``); ``models`` holds the proxy model that
gives the page an address and a view permission. Invariant: reading it changes nothing.
"""

from composition.operations.snapshot import OperationsSnapshot, operations_snapshot

__all__ = ["OperationsSnapshot", "operations_snapshot"]
