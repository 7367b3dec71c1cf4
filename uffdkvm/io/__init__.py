"""Results in and out (internal): DataFrames (frames.py), lossless JSON
(serial.py) and the aligned text tables the CLI prints (tables.py). Result's
own methods (to_frame, to_json, from_json) are the public way in."""
