"""A greedy connect four player for `classic/connect_four_v3`: win now, else block, else near the centre.

PettingZoo's observation is a `(6, 7, 2)` board flattened in C order: row 0 is the top row, column
`c` is action `c`, channel 0 holds the observer's own pieces and channel 1 the opponent's. A piece
dropped in a column lands on the lowest empty row.
"""

from __future__ import annotations

import numpy as np

from marl_ppo.eval.evaluate import EvalError

ROWS, COLUMNS = 6, 7
CENTRE_FIRST = (3, 2, 4, 1, 5, 0, 6)
"""Columns in order of preference when no move wins or blocks: the centre, then outwards, left first."""

_DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))


def decode(observation: np.ndarray) -> np.ndarray:
    """The board as a `(6, 7)` int array: 1 the observer's pieces, -1 the opponent's, 0 empty."""
    values = np.asarray(observation)
    if values.size != ROWS * COLUMNS * 2:
        raise EvalError(
            f"scripted/connect_four reads classic/connect_four_v3's 6 x 7 x 2 board ({ROWS * COLUMNS * 2} "
            f"values); this observation has {values.size}: play it on classic/connect_four_v3"
        )
    board = values.reshape(ROWS, COLUMNS, 2)
    return board[..., 0].astype(int) - board[..., 1].astype(int)


def encode(board: np.ndarray) -> np.ndarray:
    """The flat observation of `board` (1 own, -1 opponent's) as the observer sees it: `decode`'s inverse."""
    planes = np.stack([board == 1, board == -1], axis=-1)
    return planes.astype(np.float32).reshape(-1)


def landing_row(board: np.ndarray, column: int) -> int | None:
    """The row a piece dropped in `column` lands on, None when the column is full."""
    empty = np.flatnonzero(board[:, column] == 0)
    return int(empty[-1]) if empty.size else None


def completes_four(board: np.ndarray, row: int, column: int, piece: int) -> bool:
    """Whether `piece` (1 or -1) placed at (`row`, `column`) makes a line of four through that cell."""
    for d_row, d_col in _DIRECTIONS:
        count = 1
        for sign in (1, -1):
            r, c = row + sign * d_row, column + sign * d_col
            while 0 <= r < ROWS and 0 <= c < COLUMNS and board[r, c] == piece:
                count += 1
                r, c = r + sign * d_row, c + sign * d_col
        if count >= 4:
            return True
    return False


def greedy_move(board: np.ndarray, legal: np.ndarray) -> int:
    """The greedy choice on `board` (1 own, -1 opponent's) among the `legal` columns."""
    columns = [c for c in CENTRE_FIRST if legal[c] and landing_row(board, c) is not None]
    if not columns:
        raise ValueError("connect four: no legal column to play")
    for piece in (1, -1):  # a winning move first, then a block of the opponent's winning move
        for column in columns:
            row = landing_row(board, column)
            if row is not None and completes_four(board, row, column, piece):
                return column
    return columns[0]


def connect_four(observation: np.ndarray, action_mask: np.ndarray | None, agent: str) -> int:
    """`scripted/connect_four`: win now if it can, else block the opponent's immediate win, else the
    legal column nearest the centre (ties to the left)."""
    board = decode(observation)
    legal = np.ones(COLUMNS, bool) if action_mask is None else np.asarray(action_mask, bool)
    return greedy_move(board, legal)
