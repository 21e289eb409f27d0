"""Does it pay? Run-to-run variance, one comparison of two servers (paired bootstrap by prompt plus
run to run), its typed verdict, what would decide an inconclusive one, crossovers, and acceptance
length per suite."""
