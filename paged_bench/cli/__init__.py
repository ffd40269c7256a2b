"""The command-line app around ``app.run_job``: a job's life under Hydra (``job``), sweeps
(``sweep``), progress bars (``progress``), and what there is to run (``catalog``)."""
