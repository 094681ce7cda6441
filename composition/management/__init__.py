"""The ``manage.py`` commands (``commands``) and what several of them share: the one-line answer
when the database does not (``database_errors``), the pause commands' arguments, operator and
table (``pause_command``), the retention option (``retention_option``)."""
