"""The app's models live beside the code that uses them; Django finds them here."""

# Each subsystem adds one import line below for its models.
