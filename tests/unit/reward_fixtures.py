"""Reward functions for test_reward.py, importable by spec (process pools need that)."""

import time


def match(task, text):
    return 1.0 if text == task["answer"] else 0.0


async def async_half(task, text):
    return 0.5


def divide_by_zero(task, text):
    return 1 / 0


def nan(task, text):
    return float("nan")


def missing_key(task, text):
    return task["missing"]


def hang(task, text):
    time.sleep(60)
    return 1.0


def hang_on_7(task, text):
    if text == "7":
        time.sleep(60)
    return match(task, text)


def length_parity(task, text):
    """1 for an even number of characters: from an untrained model, groups with and without variance."""
    return float(len(text) % 2 == 0)
