"""A Result and its forms: its fields as the result schema declares them, the
checks from_json makes, JSON, DataFrames, and values in and out.
"""
