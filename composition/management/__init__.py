"""The ``manage.py`` commands (``commands``) and what they share or keep apart: the one-line answer
when the database does not (``database_errors``), a reader gone from a pipe (``closed_pipe``), the
pause commands' arguments, operator and table (``pause_command``), the retention option
(``retention_option``), and how ``deadletters`` reads on a terminal and as JSON
(``dead_letter_listing``)."""
