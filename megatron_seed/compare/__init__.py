"""Comparisons of methods at matched budgets (`seed compare`): one job per (method, seed)
(`job`), the reports and tables (`report`) and their intervals (`stats`). Runs any model,
recipe and environment; the test bed's tiny world is one of them."""
