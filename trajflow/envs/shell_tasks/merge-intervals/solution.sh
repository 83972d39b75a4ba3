sed -i 's/    for start, end in intervals:/    for start, end in sorted(intervals):/' intervals.py
