"""Decoupled GAE (VC-PPO, VAPO section 4.1): critic targets with lambda_critic (1.0: Monte-Carlo-like,
unbiased), actor advantages with lambda_policy. Off: one lambda (the policy's) for both."""

from dataclasses import replace

from vapo_lit.components.base import Component


class DecoupledGAE(Component):
    name = "decoupled_gae"
    declares = ("decoupled_gae", "lambda_critic")

    def advantage_settings(self, s):
        return replace(s, lam_critic=self.values["lambda_critic"])
