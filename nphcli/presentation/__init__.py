"""Presenting results: plots of metrics against settings, the comparison picture of queries and
retrievals, and the self-contained HTML report. Given rows and pictures, never reading files."""
