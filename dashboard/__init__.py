"""rankscope.dashboard: the Dash app and static report pages, built from a Diagnosis."""
