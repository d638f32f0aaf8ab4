"""The scripted players the project ships (`scripted/NAME` partners): one module per game.

Each is a policy in the form `marl_ppo.eval.players` drives: `policy(observation, action_mask, agent)
-> action` over the agent's flat observation as the trained policy sees it; a class is instantiated
per env copy and reset at each new episode.
"""
