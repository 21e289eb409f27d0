"""Reading the cells: the one door into the measurements (every cell's requests read once, as arrays
and rows, with the estimators the bootstrap resamples) and the design of repeats every question reads
them under (fixed or sequential)."""
