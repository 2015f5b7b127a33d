"""How error messages refer to a row: the 1-based data row (header not counted), plus its timestamp."""
from typing import Optional

import pandas as pd


def describe_row(index: int, timestamps: Optional[pd.DatetimeIndex] = None) -> str:
    """``'data row 5 (1-based, header not counted; timestamp 2020-01-01 04:00:00)'`` for 0-based ``index``."""
    where = f"data row {index + 1} (1-based, header not counted"
    if timestamps is not None and 0 <= index < len(timestamps):
        where += f"; timestamp {timestamps[index]}"
    return where + ")"
