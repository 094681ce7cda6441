"""Jobs used only by the tests (declared at app ready)."""
