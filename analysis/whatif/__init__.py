"""The what-if dependency model of a job and the scenarios replayed on it (OSDI'25)."""
