"""Models used only by the tests."""
