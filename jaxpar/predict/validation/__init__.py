"""`--validate`: each profile's predictions beside figures it was not fitted to (report), and a
suite's rows beside their published or measured references (suite_checks)."""
