"""ppo: proximal policy optimisation on a gymnasium vector environment.

A modern stand-in for the original suite's Atari and MiniGrid reinforcement
learning tests (their packages and game ROMs cannot be installed today).
``--num-envs`` copies of a classic-control environment (``CartPole-v1`` by
default; other discrete classic-control ids such as ``Acrobot-v1`` work
too) step in a ``gymnasium.vector.SyncVectorEnv`` (same-step autoreset). Each
iteration collects ``--num-steps`` steps from every copy with the actor-critic
MLP on the device, computes advantages with GAE(λ), then runs
``--update-epochs`` epochs of minibatch updates of the clipped PPO objective
plus value and entropy terms. Truncation is treated as termination (no
bootstrapping from the final observation), a common simplification.

Stresses: the host↔device round trip of every environment step (one small
forward pass and a copy each way), the Python simulators on the CPU, then a
burst of small-batch training. An **item is one environment step** (a step
of one environment copy); a training step is one PPO iteration of
``num_envs × num_steps`` items.
"""

import gymnasium as gym
import numpy as np
import torch
from coleo import Option, default, tooled
from torch import nn

from ..bench import init_torch, iteration_wrapper
from ..bench.options import lr_option, precision_option
from ..bench.step import MixedPrecisionStep, make_optimizer


def main(exp, argv):
    """Entry point: ``milarun run milarun.models.ppo:main -- ARGS``.

    Items are environment steps.
    """
    exp.cli(train, argv)


def _layer(i, o, std=2**0.5):
    """A linear layer with orthogonal weights of gain ``std`` and zero biases."""
    lin = nn.Linear(i, o)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.zeros_(lin.bias)
    return lin


class Agent(nn.Module):
    """The actor-critic: two tanh MLPs over the observation, one for the value and one
    for the action logits."""

    def __init__(self, n_obs, n_act, hidden):
        super().__init__()
        self.critic = nn.Sequential(
            _layer(n_obs, hidden),
            nn.Tanh(),
            _layer(hidden, hidden),
            nn.Tanh(),
            _layer(hidden, 1, 1.0),
        )
        self.actor = nn.Sequential(
            _layer(n_obs, hidden),
            nn.Tanh(),
            _layer(hidden, hidden),
            nn.Tanh(),
            _layer(hidden, n_act, 0.01),
        )

    def value(self, x):
        return self.critic(x).squeeze(-1)

    def act(self, x, action=None):
        dist = torch.distributions.Categorical(logits=self.actor(x).float())
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.value(x).float()


@tooled
def train(exp):
    # Gymnasium environment id (discrete actions, vector observations)
    env_name: Option = default("CartPole-v1")
    # Environment copies stepped together
    num_envs: Option & int = default(8)
    # Steps collected from each copy per iteration
    num_steps: Option & int = default(128)
    # Hidden units of the actor and critic MLPs
    hidden: Option & int = default(64)
    lr = lr_option(default=2.5e-4)
    # Discount factor
    gamma: Option & float = default(0.99)
    # GAE lambda
    gae_lambda: Option & float = default(0.95)
    # Minibatches per update epoch
    num_minibatches: Option & int = default(4)
    # Update epochs per iteration
    update_epochs: Option & int = default(4)
    # PPO clipping coefficient
    clip_coef: Option & float = default(0.2)
    # Entropy bonus weight
    ent_coef: Option & float = default(0.01)
    # Value loss weight
    vf_coef: Option & float = default(0.5)
    # Gradient clipping norm
    max_grad_norm: Option & float = default(0.5)
    precision = precision_option(default="fp32")

    device = init_torch(exp)
    mp = MixedPrecisionStep(device, precision)
    autocast = mp.autocast
    seed = exp.options["seed"]
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_name) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(envs.single_action_space.n)
    agent = Agent(n_obs, n_act, hidden).to(device)
    optimizer = make_optimizer("Adam", agent.parameters(), device, lr=lr, eps=1e-5)

    T, N = num_steps, num_envs
    obs_buf = torch.zeros((T, N, n_obs), device=device)
    act_buf = torch.zeros((T, N), dtype=torch.int64, device=device)
    logp_buf = torch.zeros((T, N), device=device)
    rew_buf = torch.zeros((T, N), device=device)
    done_buf = torch.zeros((T, N), device=device)
    val_buf = torch.zeros((T, N), device=device)
    obs, _ = envs.reset(seed=seed)
    next_obs = torch.as_tensor(obs, dtype=torch.float32, device=device)
    batch = T * N
    mb = max(1, batch // num_minibatches)
    ep_returns = np.zeros(N)
    finished = []

    for step in iteration_wrapper(exp):
        # Rollout: one forward pass and one host↔device copy per environment step.
        with torch.no_grad():
            for t in range(T):
                obs_buf[t] = next_obs
                with autocast:
                    action, logp, _, v = agent.act(next_obs)
                act_buf[t], logp_buf[t], val_buf[t] = action, logp, v
                o, r, term, trunc, _ = envs.step(action.cpu().numpy())
                done = np.logical_or(term, trunc)
                ep_returns += r
                for k in np.nonzero(done)[0]:
                    finished.append(ep_returns[k])
                    ep_returns[k] = 0.0
                rew_buf[t] = torch.as_tensor(r, dtype=torch.float32, device=device)
                done_buf[t] = torch.as_tensor(done, dtype=torch.float32, device=device)
                next_obs = torch.as_tensor(o, dtype=torch.float32, device=device)
            # GAE(λ); same-step autoreset: next_obs after a done step is a new episode.
            with autocast:
                next_val = agent.value(next_obs).float()
            adv = torch.zeros((T, N), device=device)
            last = torch.zeros(N, device=device)
            for t in reversed(range(T)):
                nv = next_val if t == T - 1 else val_buf[t + 1]
                live = 1.0 - done_buf[t]
                delta = rew_buf[t] + gamma * nv * live - val_buf[t]
                last = delta + gamma * gae_lambda * live * last
                adv[t] = last
            ret = adv + val_buf

        b_obs, b_act = obs_buf.reshape(batch, n_obs), act_buf.reshape(batch)
        b_logp, b_adv, b_ret = logp_buf.reshape(batch), adv.reshape(batch), ret.reshape(batch)
        for _ in range(update_epochs):
            perm = torch.randperm(batch, device=device)
            for lo in range(0, batch, mb):
                idx = perm[lo : lo + mb]
                with autocast:
                    _, logp, ent, v = agent.act(b_obs[idx], b_act[idx])
                ratio = (logp - b_logp[idx]).exp()
                a = b_adv[idx]
                a = (a - a.mean()) / (a.std() + 1e-8) if a.numel() > 1 else a
                pg = torch.max(-a * ratio, -a * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
                vloss = 0.5 * ((v - b_ret[idx]) ** 2).mean()
                loss = pg + vf_coef * vloss - ent_coef * ent.mean()
                optimizer.zero_grad(set_to_none=True)
                mp(loss, optimizer, clip_norm=max_grad_norm, params=agent.parameters())
        step.set_count(batch)
        step.log(loss=loss.detach())
    envs.close()
    if finished:
        tail = finished[-20:]
        exp.metrics["episode_return"] = float(sum(tail) / len(tail))
        exp.metrics["episodes"] = len(finished)
