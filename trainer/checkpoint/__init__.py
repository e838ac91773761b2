"""Where the training state goes and comes back from: the stores (a local dir, ``s3://``), the
manager (manifest last, background saves, keep-last-k, rank 0 reads), the broadcast of what rank
0 read to the other ranks, and the cadence of saves in the loop."""
