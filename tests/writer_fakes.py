"""What IncidentWriter talks to, faked for the fast tier: the job's store protocol, the leader's own answer and the
abort policy. No store, no process."""


class StoreJob:
    """The store protocol as the writer uses it: `answers` are what the ranks answer, all at once; `natives(ranks)`
    is what each asked rank's native stacks read (none by default)."""

    def __init__(self, answers: dict, natives=None):
        self.answers, self.infos, self.posted = dict(answers), [], {}
        self._natives = natives

    def open_incident(self, info: dict) -> int:
        self.infos.append(info)
        return len(self.infos)

    def contribute(self, number: int, rank: int, doc: dict) -> None:
        self.answers[rank] = doc

    def collect(self, number: int, deadline: float, answering: int) -> dict:
        return dict(self.answers)

    def with_history(self, views: dict) -> dict:
        return views

    def natives(self, number: int, ranks) -> dict:
        return {} if self._natives is None else self._natives(ranks)

    def post_verdict(self, number: int, verdict: dict) -> None:
        self.posted[number] = verdict

    def release(self, fingerprint: str) -> None:
        self.released = getattr(self, "released", []) + [fingerprint]


class OwnAnswer:
    """The leader's own answer (rank 0's state), contributed when the writer asks; `asked`: the `since` of each ask."""

    def __init__(self, job: StoreJob, state: dict):
        self.job, self.state, self.asked = job, state, []

    def own(self, number: int, since=None) -> None:
        self.asked.append(since)
        self.job.contribute(number, 0, self.state)


class Policy:
    """The abort policy's two moments, noted in `events` ("verdict out", "report written") when a list is given."""

    def __init__(self, events: list | None = None):
        self.events = events if events is not None else []

    def verdict_out(self, incident: dict, action: str) -> None:
        self.events.append("verdict out")

    def report_written(self, incident: dict, action: str) -> None:
        self.events.append("report written")
