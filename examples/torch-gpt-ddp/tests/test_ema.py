"""The moving average of the weights (--ema-decay, ema.py) follows its formula and is swapped in and out.

Its exact resume is tested with the runs that resume (test_resume.py, test_distributed.py).
"""

import torch

from gpt_ddp.kit.checkpoint import FULL
from gpt_ddp.kit.ema import WeightAverage


def test_the_weight_average_follows_its_formula_and_loads_from_its_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    average = WeightAverage(model, decay=0.75)
    expected: dict[str, torch.Tensor] = {}
    for update in range(3):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter))
        average.update()
        weights = {name: value.clone() for name, value in model.state_dict().items()}
        # The first update copies the weights; then average = 0.75 * average + 0.25 * weights.
        expected = weights if update == 0 else {name: 0.75 * expected[name] + 0.25 * weights[name] for name in weights}
    for restored in (average, WeightAverage(model, decay=0.75)):
        if restored is not average:
            restored.load_state_dict(average.state_dict(FULL))
        with restored.swapped_in():
            for name, value in model.state_dict().items():
                torch.testing.assert_close(value, expected[name], msg=name)
        for name, value in model.state_dict().items():  # and then the model's own weights again
            torch.testing.assert_close(value, weights[name], atol=0, rtol=0, msg=name)
