"""The top floor of research: design-space exploration over a library of circuits.

circuits (the library and its hardware figures), design_space (assignments, their cost and the
error model), study_files and study_database (the study that keeps every measurement),
explore_search (the NSGA-II search and the retraining), explore_result (what an exploration
measured), exploration (the `explore` entry point).  It builds on every floor below it: data,
training (retraining in the loop) and analysis (the sweep's exact-multiplier power figures).
"""
