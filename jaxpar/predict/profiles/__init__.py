"""Hardware profiles: a machine described as data (hardware), loaded and fitted to its measured
runs (fitting, calibration_runs, with the constants' solver: solve); a calibration run and what
a profile file says to fit as typed records (records)."""
