"""The audit report: its evidence and verdict (JSON), and the page for people (HTML, charts)."""
