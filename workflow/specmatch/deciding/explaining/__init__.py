"""Why: every speedup split into tokens per step x step cost (attribution), along the context axis
(context), whether the servers did the same work and the sessions' own figures (stopping, ledger),
and the claims that rest on cells measured beside another job (interference). What a speedup would
be under other traffic or at another load is predicted next door (deciding/predicting)."""
