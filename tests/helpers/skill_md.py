"""A SKILL.md, as a folder skill ("recipes") holds it: front matter, then the instructions."""

SKILL_MD = """---
name: recipes
description: >
  Find and scale cooking recipes.
metadata: {"openclaw": {"emoji": "x"}}
---
# Recipes

To scale a recipe, multiply every quantity.
"""
