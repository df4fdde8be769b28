"""Reward functions for test_reward.py, importable by spec (process pools need that)."""

import os
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


def hang_on_7_or_slow_match(task, text):
    if text != "7":
        time.sleep(1.5)
    return hang_on_7(task, text)


def hang_on_7_or_log_slowly(task, text):
    if text != "7":
        with open(task["log"], "a") as f:
            f.write("run\n")
        time.sleep(2.0)
    return hang_on_7(task, text)


def exit_on_7(task, text):
    if text == "7":
        os._exit(3)
    return match(task, text)
