"""The job's health, watched beside the loop: a rank that makes no progress (the watchdog), a
rank that lags (stragglers), and what each run of the job cost (the goodput ledger)."""
