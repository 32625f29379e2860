"""huggingface/accelerate#2733: gather_object is called under `if distributed_state.is_main_process:` and hangs."""

EXPECT = {
    "source": "https://github.com/huggingface/accelerate/issues/2733",
    "summary": "'gather_object does work with if distributed_state.is_main_process': an inference function "
               "prints gather_object(txt_out) inside the main-process branch and the code hangs; the maintainer: "
               "gather_object must be called on every worker.",
    "family": "collective",
    "world_size": 2,
    "kind": "collective_on_subset",
    "ranks": [0],
    "line": "gather_object",
    "fix": ["every rank", "all ranks", "every process"],
}

import sys
import time
import warnings

from accelerate import Accelerator
from accelerate.utils import gather_object


def mark():
    # Printed before every collective-bearing call: the last one printed is where this rank blocks for good.
    print(f"DDPWATCH-MARK hang-forms {time.time():.3f}", file=sys.stderr, flush=True)


def grade(prompts):
    distributed_state = Accelerator(cpu=True)
    with distributed_state.split_between_processes(prompts) as shard:
        txt_out = [f"graded: {prompt}" for prompt in shard]  # the model's answers for this process's share
    if distributed_state.is_main_process:
        mark()
        print(gather_object(txt_out)[0], file=sys.stderr)  # LINE:gather_object
        print(gather_object(txt_out)[1], file=sys.stderr)
    mark()
    distributed_state.wait_for_everyone()


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    grade([f"question {i}" for i in range(8)])
