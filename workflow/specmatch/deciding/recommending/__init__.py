"""What to deploy: the on/off recommendation from the verdicts and its verification (deployment), and
which k at which load for a k sweep (kmodel, kchoice, kbands, krecommend), as engine-neutral schedules
that each engine's adapter renders."""
