"""config: the rig, mode and prompt files users edit, loaded and validated strictly up front.

May import: the bottom modules only (errors, durations, files, exit_codes, lazy).
"""
