"""Calibration on the device at hand: `--calibrate` from measured runs (from_runs, which reads
them from a bench sweep or a file: sources), `--calibrate-here` (on_device, with its
microbenchmarks: device_rates, its timed rows: model_runs, what they measured: records, and the
profile file it writes: profile_file), the microbenchmarks a profile prices with (micro),
profiler traces joined with their programs (traces) and the one timer (timer)."""
