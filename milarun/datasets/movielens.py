"""movielens: synthetic ratings in the MovieLens ml-20m layout.

Layout::

    movielens/ml-20m/ratings.csv    userId,movieId,rating,timestamp

``ratings.csv`` has the real header and column types: 1-based integer ids,
half-star ratings from 0.5 to 5.0, Unix timestamps increasing per user.
Every user has at least 20 ratings (as in ml-20m); movie popularity follows
a Zipf law; no (user, movie) pair repeats. Rows are sorted by user, then
timestamp, like the real file.

The standard size has 138,493 users and 26,744 movies like ml-20m, but
about 4M ratings instead of 20M, so the build takes tens of seconds rather
than minutes; the real file's 500 MB would mostly measure the csv parser.

``load_ratings`` is the reader the ``recom`` model uses (pandas).
"""

import numpy as np

VERSION = 1

SIZES = {
    "tiny": {"users": 200, "movies": 300, "ratings": 8_000},
    "standard": {"users": 138_493, "movies": 26_744, "ratings": 4_000_000},
}

RATINGS = "ml-20m/ratings.csv"
COLUMNS = ["userId", "movieId", "rating", "timestamp"]


def build(root, params, seed):
    """Write ``ml-20m/ratings.csv`` into ``root``."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    users, movies, total = params["users"], params["movies"], params["ratings"]
    minimum = 20
    if total < users * minimum:
        raise ValueError(f"movielens: {total} ratings cannot give {users} users 20 each")
    extra = rng.pareto(1.5, size=users) + 0.05
    extra = extra / extra.sum() * (total - users * minimum)
    counts = np.minimum(minimum + np.floor(extra).astype(np.int64), movies)
    ranks = np.arange(1, movies + 1, dtype=np.float64)
    pop = ranks**-0.9
    pop /= pop.sum()
    movie_of_rank = rng.permutation(movies) + 1
    # Oversample, then keep each user's first `count` distinct movies.
    draw = rng.choice(movies, size=int(counts.sum() * 1.3) + 64, p=pop)
    cand_users = np.repeat(np.arange(1, users + 1), np.ceil(counts * 1.3).astype(np.int64) + 1)
    draw = draw[: len(cand_users)]
    if len(draw) < len(cand_users):
        draw = np.concatenate([draw, rng.integers(0, movies, len(cand_users) - len(draw))])
    df = pd.DataFrame({"userId": cand_users, "movieId": movie_of_rank[draw]})
    df = df.drop_duplicates(["userId", "movieId"])
    df["n"] = df.groupby("userId").cumcount()
    df = df[df["n"].to_numpy() < counts[df["userId"].to_numpy() - 1]].drop(columns="n")
    n = len(df)
    # Ratings: a user bias plus a movie bias plus noise, rounded to half stars.
    ubias = rng.normal(0, 0.5, users + 1)
    mbias = rng.normal(0, 0.6, movies + 1)
    raw = (
        3.5
        + ubias[df["userId"].to_numpy()]
        + mbias[df["movieId"].to_numpy()]
        + rng.normal(0, 0.7, n)
    )
    df["rating"] = np.clip(np.round(raw * 2) / 2, 0.5, 5.0)
    start = rng.integers(789_652_000, 1_400_000_000, users + 1)
    df["timestamp"] = start[df["userId"].to_numpy()] + rng.integers(0, 40_000_000, n)
    df = df.sort_values(["userId", "timestamp"], kind="stable")
    (root / "ml-20m").mkdir()
    df[COLUMNS].to_csv(root / RATINGS, index=False, float_format="%.1f")


def load_ratings(folder):
    """The ratings of ``folder/ml-20m/ratings.csv`` as a pandas DataFrame
    (int64 ids and timestamps, float32 ratings)."""
    import pandas as pd

    return pd.read_csv(
        f"{folder}/{RATINGS}",
        header=0,
        dtype={
            "userId": np.int64,
            "movieId": np.int64,
            "rating": np.float32,
            "timestamp": np.int64,
        },
    )
