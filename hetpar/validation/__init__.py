"""Published runs: rows.py reads a runs CSV into specs, predict.py predicts and scores them."""
