"""Calibration on the device at hand: `--calibrate` from measured runs (from_runs),
`--calibrate-here` (on_device, with its microbenchmarks: device_rates, its timed rows:
model_runs, and the profile file it writes: profile_file), the microbenchmarks a profile prices
with (micro), profiler traces joined with their programs (traces) and the one timer (timer)."""
