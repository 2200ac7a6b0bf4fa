"""A shared fabric's flow records into pair traffic, a link graph, a grid fit and recognised jobs."""
