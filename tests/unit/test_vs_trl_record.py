"""bench/vs_trl.py's record of earlier figures: a rerun of one job archives what it replaces
under the commit, date and command that job ran at, never another job's command."""

from bench.vs_trl import archived, ran_job


def test_a_command_names_the_jobs_it_ran():
    assert ran_job("python bench/vs_trl.py --seeds 3", "b")  # no --jobs: every job
    assert ran_job("python bench/vs_trl.py --jobs a b --seeds 3", "b")
    assert not ran_job("python bench/vs_trl.py --jobs a --seeds 3", "b")
    assert ran_job("python bench/vs_trl.py --jobs a --seeds 3", "a")


def test_a_job_run_apart_is_archived_without_the_other_jobs_command():
    """Both jobs ran at one commit, job B first: the file then holds job A's command and date."""
    old = {"git_commit": "c1", "date": "13:23", "command": "python bench/vs_trl.py --jobs a --seeds 3", "cpu_model": "AMD EPYC",
           "rows": [{"job": "a", "git_commit": "c1"}, {"job": "b", "git_commit": "c1"}],
           "figures": {"job_a_speed_vs_trl": 1.5, "job_a_cpu_model": "Xeon", "job_b_speed_vs_trl": 2.5, "job_b_flashq_breakdown": {"step_s": 0.1}}}
    [b] = archived(old, ["b"])
    assert b == {"git_commit": "c1", "date": None, "command": None, "job_b_cpu_model": "AMD EPYC", "job_b_speed_vs_trl": 2.5}
    [a] = archived(old, ["a"])
    assert a["command"] == old["command"] and a["date"] == "13:23" and a["job_a_speed_vs_trl"] == 1.5
    assert a["job_a_cpu_model"] == "Xeon"  # a job's own machine, where its figures name one, before the file's
