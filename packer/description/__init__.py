"""The dataset description: manifest, sample table, records, place binding, damage locators and the
format registry."""
