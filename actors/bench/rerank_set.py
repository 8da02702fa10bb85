"""A small labelled set for judging rerank quality: each query has one document that answers it
among keyword distractors that share its words but do not answer it (data only).

The answer sits at a different place in each list, so a scorer biased to a position does not
look good by accident. Top-1 accuracy: the share of cases whose answer gets the highest score.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RerankCase:
    query: str
    documents: tuple[str, ...]
    answer: int  # the index in ``documents`` of the one that answers ``query``


RERANK_SET: tuple[RerankCase, ...] = (
    RerankCase("What is the capital of France?", (
        "France is famous for its wine and cheese.",
        "Paris is the capital of France.",
        "The French flag is blue, white and red.",
        "A capital letter starts every sentence.",
        "Lyon is the third largest city in France.",
    ), 1),
    RerankCase("How many legs does a spider have?", (
        "Spiders spin webs to catch flies.",
        "Some people are afraid of spiders.",
        "A spider has eight legs.",
        "A table usually has four legs.",
        "The spider plant is easy to grow indoors.",
    ), 2),
    RerankCase("At what temperature does water boil at sea level?", (
        "Water boils at 100 degrees Celsius at sea level.",
        "Sea water tastes salty.",
        "Drinking water is good for your health.",
        "The temperature at the sea was pleasant today.",
        "Ice floats on water.",
    ), 0),
    RerankCase("Who wrote the play Romeo and Juliet?", (
        "Romeo and Juliet is a story of two young lovers.",
        "The play was performed in the park last summer.",
        "Juliet is a common name in Italy.",
        "Many films have been based on Romeo and Juliet.",
        "William Shakespeare wrote Romeo and Juliet.",
    ), 4),
    RerankCase("What do bees make?", (
        "A bee can sting when it feels threatened.",
        "Bees make honey from the nectar of flowers.",
        "The spelling bee is held every spring.",
        "Make sure to water the flowers every day.",
    ), 1),
    RerankCase("What is the largest planet in the solar system?", (
        "The solar system has eight planets.",
        "Solar panels turn sunlight into electricity.",
        "Mars is called the red planet.",
        "Earth is the only planet known to have life.",
        "The largest ocean on Earth is the Pacific.",
        "Jupiter is the largest planet in the solar system.",
    ), 5),
    RerankCase("How do plants make their food?", (
        "Plants make their food from sunlight, water and air by photosynthesis.",
        "This plant grows in shady gardens.",
        "Fast food is not good for you.",
        "The factory plant makes car parts.",
        "Some people talk to their plants.",
    ), 0),
    RerankCase("What language is spoken in Brazil?", (
        "Brazil is the largest country in South America.",
        "Learning a new language takes time.",
        "Brazil has won the football World Cup five times.",
        "People in Brazil speak Portuguese.",
        "Spanish is spoken in most of South America.",
    ), 3),
    RerankCase("How long does it take the Earth to orbit the Sun?", (
        "The Sun is a star.",
        "It takes a long time to walk around the lake.",
        "The Earth takes about 365 days to orbit the Sun.",
        "The Moon orbits the Earth.",
        "Sunscreen protects your skin from the Sun.",
    ), 2),
    RerankCase("What is the chemical symbol for gold?", (
        "Gold is a soft and shiny metal.",
        "The gold medal goes to the winner.",
        "A symbol can stand for an idea.",
        "The chemical symbol for gold is Au.",
        "Chemical reactions can release heat.",
        "Silver is cheaper than gold.",
    ), 3),
    RerankCase("Which animal is known as the king of the jungle?", (
        "The lion is called the king of the jungle.",
        "The jungle is full of tall trees.",
        "The king lived in a large castle.",
        "Many animals sleep during the day.",
    ), 0),
    RerankCase("How many days are in a week?", (
        "Last week was very busy.",
        "A year has twelve months.",
        "There are seven days in a week.",
        "Some days are longer than others in summer.",
        "The weekend is Saturday and Sunday.",
    ), 2),
    RerankCase("What is the boiling point of milk compared with water?", (
        "Milk is a good source of calcium.",
        "Water has no color.",
        "Milk boils at a slightly higher temperature than water.",
        "Cows give milk every day.",
    ), 2),
    RerankCase("Who painted the Mona Lisa?", (
        "The Mona Lisa hangs in the Louvre in Paris.",
        "Many people visit the museum to see the Mona Lisa.",
        "Painting the fence took all afternoon.",
        "Leonardo da Vinci painted the Mona Lisa.",
        "Lisa bought a new set of paints.",
    ), 3),
    RerankCase("What gas do humans need to breathe?", (
        "Breathe slowly to calm down.",
        "Cars burn gas to run.",
        "Humans need oxygen to breathe.",
        "Humans have two lungs.",
        "The gas station is closed on Sunday.",
    ), 2),
    RerankCase("How many continents are there?", (
        "Asia is the biggest continent.",
        "There are seven continents on Earth.",
        "Continental breakfast is served until ten.",
        "Some continents are joined by land.",
    ), 1),
    RerankCase("What is the fastest land animal?", (
        "Land is cheaper far from the city.",
        "The tortoise is a very slow animal.",
        "Fast trains connect the big cities.",
        "The animal shelter needs volunteers.",
        "The cheetah is the fastest land animal.",
    ), 4),
    RerankCase("What do caterpillars turn into?", (
        "Caterpillars turn into butterflies.",
        "Turn left at the next corner.",
        "Caterpillars eat a lot of leaves.",
        "A caterpillar has many small legs.",
        "Some birds eat caterpillars.",
    ), 0),
    RerankCase("Which is the longest river in the world?", (
        "The river flooded after the storm.",
        "The world is a big place.",
        "We went fishing in the river.",
        "The Nile is often called the longest river in the world.",
        "The longest day of the year is in June.",
    ), 3),
    RerankCase("How many hours are in a day?", (
        "The shop opens at nine in the morning.",
        "A day has twenty-four hours.",
        "Happy hour starts at five.",
        "Some days feel longer than others.",
        "It rained all day.",
        "An hour has sixty minutes.",
    ), 1),
)
