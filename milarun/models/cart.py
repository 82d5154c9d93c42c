"""cart: actor-critic policy gradient on gymnasium's CartPole-v1 (CPU only).

A small two-headed MLP (policy logits and state value) plays one episode at
a time, sampling actions from the policy; after each episode it takes one
Adam step on the REINFORCE loss with the value as baseline (advantage =
discounted return − value) plus the value regression loss. With
``--no-critic`` it is plain REINFORCE with normalised returns.

Always on the CPU, whatever ``--device`` says (the original suite's CPU-only
test): one forward pass per environment step is latency bound and the
simulator is Python.

Stresses: single-thread CPU speed, Python and PyTorch per-call overhead. An
**item is one environment step**; a training step is one episode.
"""

import gymnasium as gym
import torch
from coleo import Option, default, tooled

from ..bench import dataloop, init_torch
from ..bench.options import lr_option
from ..bench.step import make_optimizer


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.cart:main -- ARGS``.

    Runs on the CPU. Items are environment steps.
    """
    exp.cli(train, argv)


class Episodes:
    """Endless iterable of episode indices (the loop stops on max-count)."""

    def __iter__(self):
        n = 0
        while True:
            yield n
            n += 1


@tooled
def train(exp):
    # Gymnasium environment id (discrete actions, vector observations)
    env_name: Option = default("CartPole-v1")
    # Hidden units of the policy/value network
    hidden: Option & int = default(128)
    # Discount factor
    gamma: Option & float = default(0.99)
    lr = lr_option(default=3e-3)
    # Weight of the value loss
    value_coef: Option & float = default(0.5)
    # Plain REINFORCE with normalised returns instead of actor-critic
    no_critic: Option & bool = default(False)

    exp.options["device"] = "cpu"  # CPU-only test: ignore --device
    device = init_torch(exp)
    torch.set_num_threads(1)
    env = gym.make(env_name)
    n_obs = env.observation_space.shape[0]
    n_act = env.action_space.n
    body = torch.nn.Sequential(torch.nn.Linear(n_obs, hidden), torch.nn.ReLU())
    policy = torch.nn.Linear(hidden, n_act)
    value = torch.nn.Linear(hidden, 1)
    params = list(body.parameters()) + list(policy.parameters()) + list(value.parameters())
    optimizer = make_optimizer("Adam", params, device, lr=lr)
    seed = exp.options["seed"]
    episode_returns = []

    for step, episode in dataloop(exp, Episodes()):
        obs, _ = env.reset(seed=seed + episode)
        logps, values, rewards = [], [], []
        done = False
        while not done:
            h = body(torch.as_tensor(obs, dtype=torch.float32, device=device))
            dist = torch.distributions.Categorical(logits=policy(h))
            action = dist.sample()
            logps.append(dist.log_prob(action))
            values.append(value(h).squeeze(0))
            obs, reward, terminated, truncated, _ = env.step(int(action))
            rewards.append(float(reward))
            done = terminated or truncated
        ret, returns = 0.0, []
        for r in reversed(rewards):
            ret = r + gamma * ret
            returns.append(ret)
        returns = torch.tensor(returns[::-1], dtype=torch.float32)
        logps = torch.stack(logps)
        if no_critic:
            adv = (
                (returns - returns.mean()) / (returns.std() + 1e-8) if len(returns) > 1 else returns
            )
            loss = -(logps * adv).sum()
        else:
            values = torch.stack(values)
            adv = returns - values.detach()
            loss = -(logps * adv).mean() + value_coef * torch.nn.functional.smooth_l1_loss(
                values, returns
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        episode_returns.append(sum(rewards))
        step.set_count(len(rewards))
        step.log(loss=loss.detach())
    env.close()
    if episode_returns:
        tail = episode_returns[-10:]
        exp.metrics["episode_return"] = sum(tail) / len(tail)
        exp.metrics["episodes"] = len(episode_returns)
