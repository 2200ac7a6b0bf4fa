"""The report's types and vocabulary: what a diagnosis says. Imports nothing else from rankscope.analysis."""
