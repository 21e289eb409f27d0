"""Why, and for whom: every speedup split into tokens per step x step cost (attribution), along the
context axis (context), whether the servers did the same work and the sessions' own figures
(stopping), any traffic mix predicted from per-source measurements (traffic), and the claims that
rest on cells measured beside another job (interference)."""
