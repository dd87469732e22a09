"""Helpers of the browser test: a throwaway JupyterLab server and a headless Chromium."""
